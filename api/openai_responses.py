"""The `/v1` response bodies as pydantic models: completions whole and as chunks (chat and
text), errors, models and batch jobs, as vLLM's OpenAI server writes them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, model_serializer

from api.models import BatchJob, BatchJobItem
from api.openai_requests import ToolCall


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | int | None  # OpenAI's codes are strings; vLLM's errors carry their status


class ErrorResponse(BaseModel):
    error: ErrorDetail


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob] | None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    refusal: None = None
    # Only present when the answer calls tools (as vLLM's server writes it).
    tool_calls: list[ToolCall] | None = Field(default=None, json_schema_extra={"minItems": 1})

    @model_serializer(mode="wrap")
    def _without_absent_tool_calls(self, handler: Any) -> dict[str, Any]:
        data = handler(self)
        if not self.tool_calls:
            data.pop("tool_calls", None)
        return data


class Choice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None
    finish_reason: str


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    system_fingerprint: None = None
    choices: list[Choice]
    usage: Usage


class FunctionCallDelta(BaseModel):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(BaseModel):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCallDelta | None = None


class ChoiceDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChunkChoice(BaseModel):
    index: int
    delta: ChoiceDelta
    logprobs: ChoiceLogprobs | None
    finish_reason: str | None


class ChatCompletionChunk(BaseModel):
    """One server-sent event of a streamed completion; it is sent with only the fields that were
    set (`exclude_unset`), as vLLM sends its chunks."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    system_fingerprint: None = None
    choices: list[ChunkChoice]
    usage: Usage | None = None


class CompletionLogprobs(BaseModel):
    """A text choice's logprobs, in the legacy completions shape (vLLM's CompletionLogProbs)."""

    text_offset: list[int]
    token_logprobs: list[float | None]
    tokens: list[str]
    top_logprobs: list[dict[str, float] | None]


class TextChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: str | None


class TextCompletion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    system_fingerprint: None = None
    choices: list[TextChoice]
    usage: Usage


class TextCompletionChunk(BaseModel):
    """One server-sent event of a streamed text completion, sent as ChatCompletionChunk is."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    system_fingerprint: None = None
    choices: list[TextChoice]
    usage: Usage | None = None


class Model(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[Model]


class JobProgress(BaseModel):
    total: int
    pending: int
    submitted: int
    completed: int
    failed: int
    cancelled: int


class JobResultError(BaseModel):
    code: str
    message: str


class JobResult(BaseModel):
    index: int
    status: Literal[tuple(BatchJobItem.Status.values)]  # type: ignore[valid-type]
    response: ChatCompletion | None
    error: JobResultError | None


class Job(BaseModel):
    id: str
    object: Literal["job"]
    status: Literal[tuple(BatchJob.Status.values)]  # type: ignore[valid-type]
    created_at: int | None
    started_at: int | None
    finished_at: int | None
    progress: JobProgress
    results: list[JobResult] | None = Field(default=None, description="Only when a job is read by its id.")
