"""The OpenAI-compatible API under /v1/: models, chat and text completions (whole or streamed),
batch jobs.

Callers are code, not browsers: a Bearer API key authenticates every call, there is no session
and no CSRF. Views parse, authenticate, call one service and answer in OpenAI's shapes. Every
answer to a key with limits of its own carries OpenAI's x-ratelimit-* headers.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from functools import wraps
from typing import Any
from uuid import UUID

import redis
from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.urls import reverse
from django.views.decorators.csrf import csrf_exempt

from api import completions, jobs, tasks
from api import keys as api_keys
from api.errors import (
    ApiError,
    api_error_for_refusal,
    chat_request_parse,
    invalid,
    job_requests_parse,
    model_not_found,
    request_too_large,
    text_completion_request_parse,
)
from api.models import ApiKey, BatchJob
from api.openai_shapes import model_list, model_object, ratelimit_headers
from api.openapi import openapi_document
from chat.sse import SSE_HEADERS
from scheduler.admission import AdmissionRefused
from scheduler.key_limits import key_limit_peek
from scheduler.models import Variant
from scheduler.workers import live_workers

View = Callable[..., Any]
# The key a request authenticated with, kept on the request for the x-ratelimit-* headers.
API_KEY_ATTRIBUTE = "api_key"


def _unreported_limits(request: HttpRequest, response: HttpResponse) -> ApiKey | None:
    """The key whose limits this answer should report and does not yet: all answers but admitted
    or rate-limited completions, which report the state their admission read."""
    api_key: ApiKey | None = getattr(request, API_KEY_ATTRIBUTE, None)
    if api_key is None or not api_key.limits.any:
        return None
    reported = any(response.has_header(f"x-ratelimit-limit-{kind}") for kind in ("requests", "tokens"))
    return None if reported else api_key


def _ratelimit_headers_add(api_key: ApiKey, response: HttpResponse) -> HttpResponse:
    """The key's limits as they stand, read without charging them."""
    try:
        state = key_limit_peek(api_key.client_id, api_key.limits)
    except redis.RedisError:
        return response  # the answer matters more than its headers
    for name, value in ratelimit_headers(state).items():
        response[name] = value
    return response


def api_view(method: str) -> Callable[[View], View]:
    """CSRF-exempt (bearer auth), one HTTP method, ApiError answered in OpenAI's shape, and the
    key's x-ratelimit-* headers."""

    def not_allowed() -> HttpResponse:
        response = ApiError(405, f"Use {method} for this endpoint.").response()
        response["Allow"] = method
        return response

    def decorate(view: View) -> View:
        if asyncio.iscoroutinefunction(view):

            @wraps(view)
            async def async_wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
                if request.method != method:
                    return not_allowed()
                try:
                    response = await view(request, *args, **kwargs)
                except ApiError as exc:
                    response = exc.response()
                api_key = _unreported_limits(request, response)
                if api_key is not None:
                    await sync_to_async(_ratelimit_headers_add)(api_key, response)
                return response

            return csrf_exempt(async_wrapper)

        @wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if request.method != method:
                return not_allowed()
            try:
                response = view(request, *args, **kwargs)
            except ApiError as exc:
                response = exc.response()
            api_key = _unreported_limits(request, response)
            return response if api_key is None else _ratelimit_headers_add(api_key, response)

        return csrf_exempt(wrapper)

    return decorate


def _authenticated(request: HttpRequest) -> ApiKey:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(
            401,
            "You didn't provide an API key. Send it in the header `Authorization: Bearer sk-...`.",
            code="invalid_api_key",
        )
    try:
        api_key = api_keys.api_key_authenticate(plaintext=token.strip())
    except api_keys.ApiKeyInvalid as exc:
        raise ApiError(401, str(exc), code="invalid_api_key") from exc
    setattr(request, API_KEY_ATTRIBUTE, api_key)
    return api_key


def _json_body(request: HttpRequest) -> Any:
    limit = settings.API_MAX_BODY_BYTES
    too_large = ApiError(413, f"The request body is larger than {limit} bytes.", code="request_too_large")
    try:
        body = request.body
    except RequestDataTooBig:
        raise too_large from None
    if len(body) > limit:
        raise too_large
    try:
        return json.loads(body)
    except ValueError:
        raise invalid("The request body is not valid JSON.") from None


def _live_models() -> dict[str, str]:
    """Variant -> the engines serving it, for variants whose model has a live worker that is
    not draining."""
    engines: dict[str, set[str]] = {}
    for worker in live_workers():
        if not worker.state.get("draining"):
            engines.setdefault(worker.model, set()).add(worker.engine)
    return {
        variant.name: ", ".join(sorted(engines[variant.model]))
        for variant in Variant.objects.filter(model__in=engines)
    }


@csrf_exempt
def not_found(request: HttpRequest, path: str) -> HttpResponse:
    """Any other path under /v1: OpenAI clients read errors as JSON, never an HTML page."""
    return ApiError(404, f"There is no endpoint /v1/{path}.", code="unknown_url").response()


@api_view("GET")
def openapi(request: HttpRequest) -> HttpResponse:
    """The OpenAPI document of /v1, public like any API reference."""
    return JsonResponse(openapi_document())


@api_view("GET")
def models(request: HttpRequest) -> HttpResponse:
    _authenticated(request)
    return JsonResponse(model_list(_live_models()))


@api_view("GET")
def model_detail(request: HttpRequest, model_id: str) -> HttpResponse:
    _authenticated(request)
    live = _live_models()
    if model_id not in live:
        raise ApiError(
            404, f"The model {model_id!r} has no live worker.", code="model_not_found", param="model"
        )
    return JsonResponse(model_object(model_id, live[model_id]))


def _completion_admit(
    request: HttpRequest, parse: Callable[[Any], completions.AnyCompletionRequest]
) -> completions.SubmittedCompletion:
    """Authenticate, validate and submit: everything synchronous, in one trip to a thread."""
    api_key = _authenticated(request)
    parsed = parse(_json_body(request))
    try:
        return completions.completion_submit(api_key=api_key, request=parsed)
    except AdmissionRefused as refusal:
        headers = ratelimit_headers(refusal.key_state) if refusal.key_state else None
        raise api_error_for_refusal(refusal, headers) from None


async def _completion_answer(
    request: HttpRequest, parse: Callable[[Any], completions.AnyCompletionRequest]
) -> HttpResponse:
    submitted = await sync_to_async(_completion_admit)(request, parse)
    if submitted.request.stream:
        response: HttpResponse = StreamingHttpResponse(
            completions.completion_stream(submitted),
            content_type="text/event-stream",
            headers=SSE_HEADERS,
        )
    else:
        response = JsonResponse(await completions.completion_collect(submitted))
    for name, value in submitted.ratelimit_headers.items():
        response[name] = value
    return response


@api_view("POST")
async def chat_completions(request: HttpRequest) -> HttpResponse:
    return await _completion_answer(request, chat_request_parse)


@api_view("POST")
async def text_completions(request: HttpRequest) -> HttpResponse:
    """The legacy /v1/completions: a raw prompt, no chat template."""
    return await _completion_answer(request, text_completion_request_parse)


def _owned_job(request: HttpRequest, job_id: UUID) -> BatchJob:
    api_key = _authenticated(request)
    try:
        return jobs.job_get(job_id=job_id, owner=api_key.owner)
    except BatchJob.DoesNotExist:
        raise ApiError(404, f"No job with id {job_id}.", code="job_not_found") from None


@api_view("POST")
def job_create(request: HttpRequest) -> HttpResponse:
    api_key = _authenticated(request)
    requests = job_requests_parse(_json_body(request))
    try:
        job = jobs.job_create(api_key=api_key, requests=requests)
    except jobs.ModelUnknown as exc:
        raise model_not_found(exc.model) from None
    except jobs.RequestTooLarge as exc:
        raise request_too_large(
            api_key=api_key,
            tokens=exc.tokens,
            tokens_per_minute=exc.tokens_per_minute,
            param=f"requests[{exc.index}]",
        ) from None
    except jobs.TooManyActiveJobs as exc:
        # No honest Retry-After: jobs take as long as they take. Clients should not loop.
        raise ApiError(429, str(exc), type="requests", code="too_many_active_jobs", retryable=False) from None
    tasks.job_start(job.pk)
    response = JsonResponse(jobs.job_object(job, jobs.job_progress(job=job)), status=202)
    response["Location"] = reverse("api:job", args=[job.pk])
    return response


@api_view("GET")
def job_detail(request: HttpRequest, job_id: UUID) -> HttpResponse:
    job = _owned_job(request, job_id)
    return JsonResponse(jobs.job_object(job, jobs.job_progress(job=job), jobs.job_items(job=job)))


@api_view("POST")
def job_cancel(request: HttpRequest, job_id: UUID) -> HttpResponse:
    job = _owned_job(request, job_id)
    if not jobs.job_cancel(job=job) and job.status == BatchJob.Status.COMPLETED:
        raise ApiError(409, "This job has already completed.", code="job_completed")
    return JsonResponse(jobs.job_object(job, jobs.job_progress(job=job)))
