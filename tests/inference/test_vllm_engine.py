"""VllmEngine against real vLLM and the prepared SmolLM2: streaming, batching, abort, engine death.

One engine serves the whole module (it takes ~30-40 s to start on CPU). Its AsyncLLM belongs
to the event loop it was started on, so every test runs its coroutine on that same loop.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import jsonschema
import psutil
import pytest
from django.conf import settings
from tokenizers import Tokenizer

from inference.engines.base import Continuation, Delta, EngineDeadError, EngineRequestError, GenerationRequest
from inference.engines.vllm import VllmEngine, engine_args, engine_dtype, server_flags
from inference.model_prep import default_model_dir, prepare_model
from scheduler.generation import SamplingParams, StructuredOutput

pytestmark = pytest.mark.vllm

T = TypeVar("T")

# Greedy prompts that SmolLM2 answers at length, so they are still streaming when the test acts.
LONG_ANSWER = "Count from 1 to 200, separated by commas."
QUESTIONS = [
    "How do I reset my password?",
    "Where is my order?",
    "Can I change my delivery address?",
    "How do I cancel my subscription?",
]
# A hang guard only: every wait below ends in well under a second on a healthy engine.
HANG_GUARD_S = 60.0


@dataclass
class EngineOnLoop:
    engine: VllmEngine
    loop: asyncio.AbstractEventLoop

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(asyncio.wait_for(coro, HANG_GUARD_S * 3))


@pytest.fixture(scope="module")
def vllm_engine() -> Iterator[EngineOnLoop]:
    model_dir = default_model_dir(Path(settings.BASE_DIR))
    prepare_model(output=model_dir)  # returns at once when the folder is already complete
    engine = VllmEngine(
        model_path=str(model_dir),
        max_num_seqs=8,
        max_model_len=1024,
        gpu_memory_utilization=0.5,
        kv_cache_space_gib=1,
    )
    loop = asyncio.new_event_loop()
    loop.run_until_complete(engine.start())
    try:
        yield EngineOnLoop(engine=engine, loop=loop)
    finally:
        loop.run_until_complete(engine.shutdown())
        loop.close()


def _request(request_id: str, question: str, max_tokens: int) -> GenerationRequest:
    return GenerationRequest(
        request_id=request_id,
        messages=[{"role": "user", "content": question}],
        sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0, top_p=1.0),
    )


async def _collect(engine: VllmEngine, request: GenerationRequest) -> list[Delta]:
    return [delta async for delta in engine.generate(request)]


async def _wait_until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(HANG_GUARD_S):
        # stats() is a sampled reading (the worker polls it too): there is no event to await.
        while not condition():  # noqa: ASYNC110
            await asyncio.sleep(0.02)


def test_concurrent_generations_stream_text_and_finish(vllm_engine: EngineOnLoop) -> None:
    engine = vllm_engine.engine
    max_running_seen = 0

    async def scenario() -> list[list[Delta]]:
        nonlocal max_running_seen

        async def watch_stats() -> None:
            nonlocal max_running_seen
            while True:
                max_running_seen = max(max_running_seen, engine.stats().running)
                await asyncio.sleep(0.05)

        watcher = asyncio.create_task(watch_stats())
        try:
            return await asyncio.gather(
                *(_collect(engine, _request(f"concurrent-{i}", q, 32)) for i, q in enumerate(QUESTIONS))
            )
        finally:
            watcher.cancel()

    results = vllm_engine.run(scenario())

    for deltas in results:
        assert "".join(d.text for d in deltas).strip()
        assert deltas[-1].finish_reason in {"stop", "length"}
        assert all(d.finish_reason is None for d in deltas[:-1])
        counts = [d.output_tokens for d in deltas]
        assert counts == sorted(counts) and 0 < counts[-1] <= 32
        assert deltas[0].prompt_tokens > 0
    assert max_running_seen > 1, "the engine never batched the concurrent requests"
    stats = engine.stats()
    assert stats.memory_source in {"process-rss", "cuda"}
    assert 0 < stats.memory_used_bytes < stats.memory_total_bytes


def test_a_prompt_asked_again_is_found_in_the_prefix_cache_and_counted(vllm_engine: EngineOnLoop) -> None:
    engine = vllm_engine.engine
    # Long enough for whole KV blocks (16 tokens) to be cached and found again.
    question = " ".join(QUESTIONS * 8)
    before = engine.stats()
    vllm_engine.run(_collect(engine, _request("prefix-first", question, 4)))
    first = engine.stats()
    vllm_engine.run(_collect(engine, _request("prefix-again", question, 4)))
    vllm_engine.run(_wait_until(lambda: engine.stats().prefix_cache_queries > first.prefix_cache_queries))
    again = engine.stats()
    assert first.prefix_cache_queries > before.prefix_cache_queries
    assert again.prefix_cache_hits - first.prefix_cache_hits >= 16


def test_abort_mid_stream_frees_its_slot_and_others_finish(vllm_engine: EngineOnLoop) -> None:
    engine = vllm_engine.engine
    ids = ["survivor-1", "survivor-2", "aborted", "cancelled", "closed"]

    async def scenario() -> tuple[dict[str, list[Delta]], int]:
        streams: dict[str, list[Delta]] = {request_id: [] for request_id in ids}
        close_now = asyncio.Event()

        async def consume(request_id: str) -> None:
            stream = engine.generate(_request(request_id, LONG_ANSWER, 200))
            async for delta in stream:
                streams[request_id].append(delta)
                if request_id == "closed" and close_now.is_set():
                    break
            await stream.aclose()

        tasks = {request_id: asyncio.create_task(consume(request_id)) for request_id in ids}
        await _wait_until(lambda: all(streams.values()) and engine.stats().running == len(ids))

        await engine.abort("aborted")  # the stop button's path
        tasks["cancelled"].cancel()  # the consuming task goes away
        close_now.set()  # the consumer stops reading and closes the stream
        await _wait_until(lambda: engine.stats().running == 2)
        survivors_still_streaming = sum(not tasks[i].done() for i in ("survivor-1", "survivor-2"))

        await asyncio.gather(tasks["aborted"], tasks["closed"], tasks["survivor-1"], tasks["survivor-2"])
        return streams, survivors_still_streaming

    streams, survivors_still_streaming = vllm_engine.run(scenario())

    # The drop to 2 running came from the three stopped streams, not from the others finishing.
    assert survivors_still_streaming == 2
    assert streams["aborted"][-1].finish_reason == "abort"
    assert streams["aborted"][-1].output_tokens < 200
    for request_id in ("cancelled", "closed"):
        assert all(d.finish_reason is None for d in streams[request_id])
    for request_id in ("survivor-1", "survivor-2"):
        deltas = streams[request_id]
        assert "".join(d.text for d in deltas).strip()
        assert deltas[-1].finish_reason in {"stop", "length"}
    assert engine.stats().running == 0


def _sampled(request_id: str, question: str, sampling: SamplingParams) -> GenerationRequest:
    return GenerationRequest(
        request_id=request_id, messages=[{"role": "user", "content": question}], sampling=sampling
    )


def _text(deltas: list[Delta]) -> str:
    return "".join(delta.text for delta in deltas)


@pytest.mark.parametrize(
    "penalties",
    [{}, {"frequency_penalty": 1.0}, {"frequency_penalty": 0.5, "repetition_penalty": 1.2}],
    ids=["plain", "frequency", "frequency-and-repetition"],
)
def test_a_continued_answer_goes_on_after_its_text_without_repeating_it(
    vllm_engine: EngineOnLoop, penalties: dict[str, float]
) -> None:
    """What a preempted answer resumes with: greedy, the continuation is the rest of the answer
    the engine would have written, penalties counting the tokens written before the pause, and
    the token limit counts what was already written."""
    engine = vllm_engine.engine
    sampling = SamplingParams(max_tokens=24, temperature=0.0, top_p=1.0, **penalties)
    label = "-".join(penalties) or "plain"
    whole = vllm_engine.run(_collect(engine, _sampled(f"continued-whole-{label}", LONG_ANSWER, sampling)))
    cut = next(n for n, d in enumerate(whole) if d.output_tokens >= 8) + 1
    written = Continuation(text=_text(whole[:cut]), output_tokens=whole[cut - 1].output_tokens)
    resumed = GenerationRequest(
        request_id=f"continued-rest-{label}",
        messages=[{"role": "user", "content": LONG_ANSWER}],
        sampling=sampling,
        continuation=written,
    )
    rest = vllm_engine.run(_collect(engine, resumed))
    assert written.text + _text(rest) == _text(whole)
    assert rest[-1].output_tokens == 24 and rest[-1].finish_reason == "length"
    assert rest[0].prompt_tokens == whole[0].prompt_tokens


def test_a_continued_text_completion_goes_on_after_its_text_without_repeating_it(
    vllm_engine: EngineOnLoop,
) -> None:
    """Likewise for a raw prompt: the streamed text is appended to the prompt, no chat template."""
    engine = vllm_engine.engine

    def request(request_id: str, continuation: Continuation | None = None) -> GenerationRequest:
        return GenerationRequest(
            request_id=request_id,
            messages=[],
            prompt="1, 2, 3, 4, 5,",
            sampling=SamplingParams(max_tokens=16, temperature=0.0, top_p=1.0),
            continuation=continuation,
        )

    whole = vllm_engine.run(_collect(engine, request("text-continued-whole")))
    cut = next(n for n, d in enumerate(whole) if d.output_tokens >= 6) + 1
    written = Continuation(text=_text(whole[:cut]), output_tokens=whole[cut - 1].output_tokens)
    rest = vllm_engine.run(_collect(engine, request("text-continued-rest", written)))
    assert written.text + _text(rest) == _text(whole)
    assert rest[-1].output_tokens == 16 and rest[0].prompt_tokens == whole[0].prompt_tokens


def test_a_seed_makes_sampling_reproducible(vllm_engine: EngineOnLoop) -> None:
    def sampling(seed: int) -> SamplingParams:
        return SamplingParams(max_tokens=24, temperature=1.0, top_p=1.0, seed=seed)

    async def scenario() -> list[str]:
        engine = vllm_engine.engine
        runs = [("a", 1234), ("b", 1234), ("c", 99)]
        answers = await asyncio.gather(
            *(
                _collect(engine, _sampled(f"seeded-{name}", QUESTIONS[0], sampling(seed)))
                for name, seed in runs
            )
        )
        return [_text(deltas) for deltas in answers]

    same, again, other = vllm_engine.run(scenario())
    assert same == again
    assert same != other


def test_logprobs_come_with_every_token_and_are_at_most_zero(vllm_engine: EngineOnLoop) -> None:
    sampling = SamplingParams(max_tokens=8, temperature=0.0, top_p=1.0, logprobs=3)
    deltas = vllm_engine.run(_collect(vllm_engine.engine, _sampled("logprobs", QUESTIONS[1], sampling)))
    entries = [entry for delta in deltas for entry in delta.logprobs or ()]
    assert len(entries) == deltas[-1].output_tokens == 8
    assert "".join(entry.token for entry in entries) == _text(deltas)
    for entry in entries:
        assert entry.logprob <= 0
        # The sampled token and the 3 most likely, as vLLM's engine returns them (once each: greedy
        # samples the most likely one).
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].token == entry.token
        # Greedy: the sampled token is the most likely one.
        assert entry.logprob == max(top.logprob for top in entry.top_logprobs)


def test_a_json_schema_constrains_the_answer(vllm_engine: EngineOnLoop) -> None:
    schema = {
        "type": "object",
        "properties": {"order_id": {"type": "string", "maxLength": 12}, "urgent": {"type": "boolean"}},
        "required": ["order_id", "urgent"],
        "additionalProperties": False,
    }
    sampling = SamplingParams(
        max_tokens=64, temperature=0.0, top_p=1.0, structured=StructuredOutput(json_schema=schema)
    )
    question = "My order A-17 has not arrived. Answer in JSON."
    deltas = vllm_engine.run(_collect(vllm_engine.engine, _sampled("json-schema", question, sampling)))
    answer = json.loads(_text(deltas))
    jsonschema.validate(answer, schema)


def test_a_raw_prompt_is_continued_without_the_chat_template(vllm_engine: EngineOnLoop) -> None:
    prompt = "1, 2, 3, 4, 5, 6,"
    raw = GenerationRequest(
        request_id="raw-prompt",
        messages=[],
        prompt=prompt,
        sampling=SamplingParams(max_tokens=8, temperature=0.0, top_p=1.0),
    )
    deltas = vllm_engine.run(_collect(vllm_engine.engine, raw))
    assert "7" in "".join(d.text for d in deltas)
    tokenizer = Tokenizer.from_file(str(Path(vllm_engine.engine.model_path) / "tokenizer.json"))
    # The prompt's own tokens only: no system turn, no role markers.
    assert deltas[-1].prompt_tokens == len(tokenizer.encode(prompt).ids)


def test_the_engine_computes_in_the_dtype_chosen_for_this_machine(vllm_engine: EngineOnLoop) -> None:
    """What `vllm serve` in the differential tests is started with, too (server_flags)."""
    chosen = engine_dtype("auto", on_gpu=False, cpuinfo=Path("/proc/cpuinfo").read_text())
    engine = vllm_engine.engine._require_engine()
    expected = "bfloat16" if chosen == "auto" else chosen
    assert str(engine.model_config.dtype).removeprefix("torch.") == expected


@pytest.mark.parametrize("block_size", [0, 32])
def test_vllm_serve_given_the_server_flags_builds_the_workers_engine(settings, block_size):
    """The differential tests compare the product with `vllm serve` started with these flags:
    parsed by vLLM's own server, they must give the engine arguments the worker uses."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    def served(flags: list[str]) -> AsyncEngineArgs:
        return AsyncEngineArgs.from_cli_args(make_arg_parser(FlexibleArgumentParser()).parse_args(flags))

    settings.INFERENCE_BLOCK_SIZE = block_size  # 0: vLLM's own choice
    worker = engine_args(
        model_path=settings.INFERENCE_MODEL, max_num_seqs=8, max_model_len=1024, gpu_memory_utilization=0.5
    )
    assert worker.block_size == (block_size or None)
    server = served(server_flags(worker))
    # Where the server's own defaults differ from the dataclass's (LoRA, multimodal options), the
    # worker keeps the dataclass's: none of them touches a text model's answers.
    server_defaults, dataclass_defaults = vars(served([])), vars(AsyncEngineArgs())
    own_defaults = {name for name, value in server_defaults.items() if dataclass_defaults[name] != value}
    differing = {
        name: (value, vars(server)[name])
        for name, value in vars(worker).items()
        if name not in own_defaults and vars(server)[name] != value
    }
    assert differing == {}


# /proc/cpuinfo of this project's CI machines (AVX-512 without its BF16 extension) and of one with AMX.
CPU_WITHOUT_BF16 = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512bw avx512_vnni\n"
CPU_WITH_AMX = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
ARM_WITH_BF16 = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"


def test_a_cpu_without_bfloat16_arithmetic_computes_in_float32_and_others_as_vllm_chooses():
    assert engine_dtype("auto", on_gpu=False, cpuinfo=CPU_WITHOUT_BF16) == "float32"
    assert engine_dtype("auto", on_gpu=False, cpuinfo=CPU_WITH_AMX) == "auto"
    assert engine_dtype("auto", on_gpu=False, cpuinfo=ARM_WITH_BF16) == "auto"
    assert engine_dtype("auto", on_gpu=True, cpuinfo="") == "auto"
    # A dtype set on purpose is kept, whatever the CPU.
    assert engine_dtype("bfloat16", on_gpu=False, cpuinfo=CPU_WITHOUT_BF16) == "bfloat16"


@pytest.mark.security
@pytest.mark.parametrize(
    "structured",
    [StructuredOutput(grammar='root ::= ( "a" | '), StructuredOutput(regex="(?=a)b(?<!c)")],
    ids=["broken-grammar", "lookaround-regex"],
)
def test_a_constraint_the_engine_cannot_compile_fails_its_own_request_while_another_answer_streams(
    vllm_engine: EngineOnLoop, structured: StructuredOutput
) -> None:
    engine = vllm_engine.engine
    bad_sampling = SamplingParams(max_tokens=16, temperature=0.0, top_p=1.0, structured=structured)

    async def scenario() -> tuple[list[Delta], int, Exception | None, float]:
        streamed: list[tuple[float, Delta]] = []

        async def follow() -> None:
            async for delta in engine.generate(
                _request(f"streaming-{structured.regex is None}", LONG_ANSWER, 96)
            ):
                streamed.append((time.monotonic(), delta))

        following = asyncio.create_task(follow())
        await _wait_until(lambda: len(streamed) >= 2)
        refused: Exception | None = None
        submitted_at = time.monotonic()
        try:
            await _collect(engine, _sampled(f"bad-{structured.regex is None}", "Say a.", bad_sampling))
        except EngineRequestError as exc:
            refused = exc
        before = len(streamed)
        await following
        times = [at for at, _ in streamed if at >= submitted_at]
        gaps = [b - a for a, b in zip([submitted_at, *times], times, strict=False)]
        return [delta for _, delta in streamed], before, refused, max(gaps, default=0.0)

    deltas, streamed_when_refused, refused, longest_gap_s = vllm_engine.run(scenario())
    assert refused is not None  # its own request failed, with vLLM's reason
    assert len(deltas) > streamed_when_refused  # the other answer went on after it
    assert deltas[-1].finish_reason in {"stop", "length"}
    print(
        f"longest pause of the other answer while the constraint was refused: {longest_gap_s * 1000:.0f} ms"
    )


def _largest_schema_the_api_accepts() -> dict:
    """An object schema of string properties, each with a pattern of counted repetitions, as
    large as API_MAX_STRUCTURED_CHARS lets through."""
    properties: dict[str, dict] = {}
    schema = {"type": "object", "properties": properties, "required": []}
    n = 0
    while (
        len(json.dumps(StructuredOutput(json_schema=schema).to_dict()))
        < settings.API_MAX_STRUCTURED_CHARS - 200
    ):
        properties[f"field_{n}"] = {"type": "string", "pattern": "^[A-Z]{2,8}-[0-9]{3,12}$"}
        n += 1
    return schema


@pytest.mark.security
def test_the_largest_constraint_the_api_accepts_compiles_while_another_answer_streams(
    vllm_engine: EngineOnLoop,
) -> None:
    engine = vllm_engine.engine
    sampling = SamplingParams(
        max_tokens=16,
        temperature=0.0,
        top_p=1.0,
        structured=StructuredOutput(json_schema=_largest_schema_the_api_accepts()),
    )

    async def scenario() -> tuple[list[Delta], list[Delta], float]:
        streamed: list[tuple[float, Delta]] = []

        async def follow() -> None:
            async for delta in engine.generate(_request("streaming-beside-large", LONG_ANSWER, 96)):
                streamed.append((time.monotonic(), delta))

        following = asyncio.create_task(follow())
        await _wait_until(lambda: len(streamed) >= 2)
        submitted_at = time.monotonic()
        constrained = await _collect(engine, _sampled("large-constraint", "Fill in the form.", sampling))
        await following
        times = [at for at, _ in streamed if at >= submitted_at]
        gaps = [b - a for a, b in zip([submitted_at, *times], times, strict=False)]
        return [delta for _, delta in streamed], constrained, max(gaps, default=0.0)

    deltas, constrained, longest_gap_s = vllm_engine.run(scenario())
    assert constrained[-1].finish_reason in {"stop", "length"}
    assert deltas[-1].finish_reason in {"stop", "length"}
    print(
        f"longest pause of the other answer while the largest constraint compiled: "
        f"{longest_gap_s * 1000:.0f} ms"
    )


def test_engine_core_death_raises_engine_dead_error(vllm_engine: EngineOnLoop) -> None:
    """Last in this module (pytest keeps the file's order): it kills the shared engine's core
    process, which every test after it would find dead."""
    engine = vllm_engine.engine

    async def scenario() -> None:
        stream = engine.generate(_request("doomed", LONG_ANSWER, 200))
        await anext(stream)
        for process in psutil.Process().children(recursive=True):
            if "EngineCore" in process.name():
                os.kill(process.pid, signal.SIGKILL)
        with pytest.raises(EngineDeadError):
            async for _ in stream:
                pass
        with pytest.raises(EngineDeadError):
            await _collect(engine, _request("after-death", "Hello", 4))

    vllm_engine.run(scenario())
