"""The OpenAPI document of `/v1` (served at `GET /v1/openapi.json`), generated from the request
and response models, with the caps that come from settings written into it.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from api.openai_requests import ChatCompletionRequest, CompletionRequest, JobCreateRequest
from api.openai_responses import (
    ChatCompletion,
    ChatCompletionChunk,
    ErrorResponse,
    Job,
    Model,
    ModelList,
    TextCompletion,
    TextCompletionChunk,
)

_SCHEMAS: tuple[type[BaseModel], ...] = (
    ChatCompletionRequest,
    CompletionRequest,
    JobCreateRequest,
    ErrorResponse,
    ChatCompletion,
    ChatCompletionChunk,
    TextCompletion,
    TextCompletionChunk,
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
        404: "Not found (for a request, the model named does not exist)",
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
    chat["n"]["anyOf"][0] |= {"minimum": 1, "maximum": settings.API_MAX_N}
    text = schemas["CompletionRequest"]["properties"]
    text["max_tokens"]["anyOf"][0]["maximum"] = settings.INFERENCE_MAX_MODEL_LEN
    text["n"]["anyOf"][0] |= {"minimum": 1, "maximum": settings.API_MAX_N}
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
                        **_errors(400, 404, 413, 429, 500, 503),
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
                        **_errors(400, 404, 413, 429, 500, 503),
                    },
                }
            },
            "/v1/jobs": {
                "post": {
                    "operationId": "createJob",
                    "requestBody": {"required": True, "content": _json(JobCreateRequest)},
                    "responses": {
                        "202": {"description": "Accepted", "content": _json(Job)},
                        **_errors(400, 404, 413, 429),
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
