"""The `/v1` wire protocol as pydantic models, and the OpenAPI document generated from them
(served at `GET /v1/openapi.json`).

`openai_shapes` parses requests (with OpenAI's error for each field) and builds responses;
these models describe the same bodies for clients and for the schema-driven tests, which
check every response against them. The caps in the request schema come from settings.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from django.conf import settings
from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import models_json_schema

from api.models import BatchJob, BatchJobItem
from api.openai_shapes import MAX_STOP_SEQUENCES, MIN_TOP_P, ROLES

# --- requests -----------------------------------------------------------------------------------


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    role: Literal[tuple(ROLES)]  # type: ignore[valid-type]
    content: str | list[TextPart]


class StreamOptions(BaseModel):
    include_usage: bool | None = None


class ChatCompletionRequest(BaseModel):
    """Parameters not listed are ignored when they change nothing here (`user`, `metadata`) and
    refused with 400 when they would change the answer (`n` > 1, `tools`, `logprobs`...)."""

    model_config = ConfigDict(extra="allow")

    model: Annotated[str, Field(min_length=1)]
    messages: list[ChatMessage]
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(ge=MIN_TOP_P, le=1)] | None = None
    stop: (
        Annotated[str, Field(min_length=1)]
        | Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=MAX_STOP_SEQUENCES)]
        | None
    ) = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None


class CompletionRequest(BaseModel):
    """The legacy text completion: a raw prompt the model continues, without the chat template.
    Parameters that would change the answer and cannot be applied (`n` > 1, `echo`, `suffix`,
    `best_of`, `logprobs`, token-id prompts, several prompts...) are refused with 400."""

    model_config = ConfigDict(extra="allow")

    model: Annotated[str, Field(min_length=1)]
    prompt: (
        Annotated[str, Field(min_length=1)]
        | Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1, max_length=1)]
    )
    max_tokens: Annotated[int, Field(ge=1)] | None = Field(default=None, description="16 when left out.")
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(ge=MIN_TOP_P, le=1)] | None = None
    stop: (
        Annotated[str, Field(min_length=1)]
        | Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=MAX_STOP_SEQUENCES)]
        | None
    ) = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None


class JobCreateRequest(BaseModel):
    requests: list[ChatCompletionRequest]


# --- responses ----------------------------------------------------------------------------------


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str
    refusal: None


class Choice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: None
    finish_reason: str


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    system_fingerprint: None
    choices: list[Choice]
    usage: Usage


class TextChoice(BaseModel):
    index: int
    text: str
    logprobs: None
    finish_reason: str


class TextCompletion(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    system_fingerprint: None
    choices: list[TextChoice]
    usage: Usage


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


# --- the document -------------------------------------------------------------------------------

_SCHEMAS: tuple[type[BaseModel], ...] = (
    ChatCompletionRequest,
    CompletionRequest,
    JobCreateRequest,
    ErrorResponse,
    ChatCompletion,
    TextCompletion,
    ModelList,
    Model,
    Job,
)


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _json(model: type[BaseModel]) -> dict[str, Any]:
    return {"application/json": {"schema": _ref(model)}}


def _ratelimit_headers() -> dict[str, Any]:
    """OpenAI's headers, sent to a key with limits of its own (requests, tokens per minute)."""
    meaning = {
        "limit": "the key's limit per minute",
        "remaining": "what the key may still use now",
        "reset": 'until the limit is whole again, as OpenAI writes it ("20ms", "1.5s", "6m0s")',
    }
    return {
        f"x-ratelimit-{part}-{kind}": {
            "description": f"{kind.capitalize()}: {text}.",
            "schema": {"type": "string"},
        }
        for kind in ("requests", "tokens")
        for part, text in meaning.items()
    }


def _errors(*statuses: int) -> dict[str, Any]:
    meaning = {
        400: "Invalid request",
        401: "Missing, unknown or revoked API key",
        404: "Not found",
        405: "Wrong method",
        409: "Conflict",
        413: "Request body too large",
        429: "Rate limited (see Retry-After, and the key's x-ratelimit-* headers)",
        500: "The answer failed",
        503: "Overloaded or unavailable (see Retry-After)",
    }
    return {
        str(status): {"description": meaning[status], "content": _json(ErrorResponse)}
        for status in (*statuses, 401, 405)
    }


def _request_caps(schemas: dict[str, Any]) -> None:
    """The settings' caps, so that clients and generated tests know them."""
    chat = schemas["ChatCompletionRequest"]["properties"]
    chat["messages"] |= {"minItems": 1, "maxItems": settings.API_MAX_MESSAGES}
    for name in ("max_tokens", "max_completion_tokens"):
        chat[name]["anyOf"][0]["maximum"] = settings.INFERENCE_MAX_MODEL_LEN
    text = schemas["CompletionRequest"]["properties"]
    text["max_tokens"]["anyOf"][0]["maximum"] = settings.INFERENCE_MAX_MODEL_LEN
    text["prompt"]["anyOf"][0]["maxLength"] = settings.API_MAX_PROMPT_CHARS
    text["prompt"]["anyOf"][1]["items"]["maxLength"] = settings.API_MAX_PROMPT_CHARS
    jobs = schemas["JobCreateRequest"]["properties"]["requests"]
    jobs |= {"minItems": 1, "maxItems": settings.BATCH_JOB_MAX_REQUESTS}


def openapi_document() -> dict[str, Any]:
    _, top = models_json_schema(
        [(model, "validation") for model in _SCHEMAS], ref_template="#/components/schemas/{model}"
    )
    schemas = top["$defs"]
    _request_caps(schemas)
    model_id = {"name": "model_id", "in": "path", "required": True, "schema": {"type": "string"}}
    job_id = {
        "name": "job_id",
        "in": "path",
        "required": True,
        "schema": {"type": "string", "format": "uuid"},
    }
    document: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": "Support chat: OpenAI-compatible API",
            "version": "1",
            "description": "Chat and text completions (whole or streamed) and batch jobs. "
            "Authenticate with `Authorization: Bearer sk-...` (`python manage.py apikey create`). "
            "A key with limits of its own (requests and tokens per minute) gets OpenAI's "
            "x-ratelimit-* headers on every answer.",
        },
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}],
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "paths": {
            "/v1/models": {
                "get": {
                    "operationId": "listModels",
                    "summary": "Variants with a live worker",
                    "responses": {"200": {"description": "OK", "content": _json(ModelList)}, **_errors()},
                }
            },
            "/v1/models/{model_id}": {
                "get": {
                    "operationId": "getModel",
                    "parameters": [model_id],
                    "responses": {"200": {"description": "OK", "content": _json(Model)}, **_errors(404)},
                }
            },
            "/v1/chat/completions": {
                "post": {
                    "operationId": "createChatCompletion",
                    "requestBody": {"required": True, "content": _json(ChatCompletionRequest)},
                    "responses": {
                        "200": {
                            "description": "The answer; with `stream: true`, OpenAI's chunks as "
                            "server-sent events ending with `data: [DONE]`",
                            "content": {
                                **_json(ChatCompletion),
                                # One schema per event: `data` is a chunk's JSON, an error's, or [DONE].
                                "text/event-stream": {
                                    "schema": {
                                        "type": "object",
                                        "properties": {"data": {"type": "string"}},
                                        "required": ["data"],
                                    }
                                },
                            },
                        },
                        **_errors(400, 413, 429, 500, 503),
                    },
                }
            },
            "/v1/completions": {
                "post": {
                    "operationId": "createCompletion",
                    "requestBody": {"required": True, "content": _json(CompletionRequest)},
                    "responses": {
                        "200": {
                            "description": "The completion; with `stream: true`, text_completion "
                            "chunks as server-sent events ending with `data: [DONE]`",
                            "content": {
                                **_json(TextCompletion),
                                "text/event-stream": {
                                    "schema": {
                                        "type": "object",
                                        "properties": {"data": {"type": "string"}},
                                        "required": ["data"],
                                    }
                                },
                            },
                        },
                        **_errors(400, 413, 429, 500, 503),
                    },
                }
            },
            "/v1/jobs": {
                "post": {
                    "operationId": "createJob",
                    "requestBody": {"required": True, "content": _json(JobCreateRequest)},
                    "responses": {
                        "202": {"description": "Accepted", "content": _json(Job)},
                        **_errors(400, 413, 429),
                    },
                }
            },
            "/v1/jobs/{job_id}": {
                "get": {
                    "operationId": "getJob",
                    "parameters": [job_id],
                    "responses": {"200": {"description": "OK", "content": _json(Job)}, **_errors(404)},
                }
            },
            "/v1/jobs/{job_id}/cancel": {
                "post": {
                    "operationId": "cancelJob",
                    "parameters": [job_id],
                    "responses": {"200": {"description": "OK", "content": _json(Job)}, **_errors(404, 409)},
                }
            },
        },
    }
    # Every answer to a key with limits of its own may carry them.
    for operations in document["paths"].values():
        for operation in operations.values():
            for response in operation["responses"].values():
                response["headers"] = _ratelimit_headers()
    return document
