"""The inference worker's side of Redis and of the generation record, played by a test: read
what was queued, publish events, store how an answer ended."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from asgiref.sync import async_to_sync
from django.test import AsyncClient

from scheduler import keys
from scheduler.generation import AnswerFold, Done, GenerationJob, event_decode
from scheduler.models import Generation
from scheduler.redis import sync_redis
from scheduler.services import GenerationOutcome, generation_finish
from tests.generation_jobs import MODEL


def queued(tier: str, model: str = MODEL) -> list[dict[str, Any]]:
    """The jobs waiting in a tier's queue, flattened: request_id, messages or prompt, sampling
    fields..."""
    entries = sync_redis().xrange(keys.queue(model, tier))
    jobs = [GenerationJob.decode(fields["job"]) for _, fields in entries]
    return [
        {
            "request_id": job.request_id,
            "messages": job.messages,
            "prompt": job.prompt,
            "client_id": job.client_id,
            "variant": job.variant,
            "disconnect_grace_s": job.disconnect_grace_s,
            "conversation_id": job.conversation_id,
            **job.sampling.to_dict(),
        }
        for job in jobs
    ]


def wait_queued(tier: str, count: int = 1, timeout_s: float = 5.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        jobs = queued(tier)
        if len(jobs) >= count:
            return jobs
        time.sleep(0.01)
    raise AssertionError(f"{count} job(s) were not queued in {tier} within {timeout_s}s")


def publish(request_id: str, *events: tuple[str, dict[str, Any]], model: str = MODEL) -> None:
    client = sync_redis()
    for kind, data in events:
        client.xadd(keys.result(model, request_id), {"type": kind, "data": json.dumps(data)})


def end(request_id: str, *events: tuple[str, dict[str, Any]], model: str = MODEL) -> None:
    """Publish the events that end an answer, storing it first as the worker does."""
    answer = AnswerFold()
    for _, fields in sync_redis().xrange(keys.result(model, request_id)):
        answer.add(event_decode(fields["type"], json.loads(fields["data"])))
    answer.add_all(event_decode(kind, data) for kind, data in events)
    match answer.end:
        case Done(finish_reason="cancelled"):
            outcome = GenerationOutcome(status=Generation.Status.CANCELLED, text=answer.text)
        case Done(finish_reason=reason, usage=usage):
            outcome = GenerationOutcome(
                status=Generation.Status.DONE, text=answer.text, finish_reason=reason, usage=usage
            )
        case error:
            outcome = GenerationOutcome(
                status=Generation.Status.ERROR,
                text=answer.text,
                error_code=error.code,
                error_message=error.message,
            )
    generation_finish(request_id=request_id, outcome=outcome)
    publish(request_id, *events, model=model)


def tokens(*texts: str) -> list[tuple[str, dict[str, Any]]]:
    return [("token", {"seq": n, "text": text}) for n, text in enumerate(texts)]


def done(finish_reason: str = "stop", prompt_tokens: int = 7, completion_tokens: int = 3) -> tuple[str, dict]:
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}
    return ("done", {"finish_reason": finish_reason, "usage": usage, "timings": {}})


def answer(request_id: str, *texts: str, model: str = MODEL) -> None:
    """A whole answer: start, the tokens, done; stored as the worker stores it."""
    publish(request_id, ("start", {"attempt": 1}), *tokens(*texts), model=model)
    end(request_id, done(completion_tokens=len(texts)), model=model)


def post_answered(
    path: str, body: dict, headers: dict[str, str], *answers: list[tuple[str, dict[str, Any]]]
) -> tuple[Any, list[dict[str, Any]], str]:
    """POST an API request of len(answers) choices while this double answers each with its
    events: the response, the jobs queued, and the streamed body ('' when not streamed)."""

    async def scenario() -> tuple[Any, list[dict[str, Any]], str]:
        call = asyncio.create_task(
            AsyncClient().post(path, json.dumps(body), content_type="application/json", headers=headers)
        )
        jobs = await asyncio.to_thread(wait_queued, "normal", len(answers))
        for job, events in zip(jobs, answers, strict=True):
            await asyncio.to_thread(publish, job["request_id"], *events)
        response = await call
        streamed = (
            b"".join([chunk async for chunk in response.streaming_content]) if response.streaming else b""
        )
        return response, jobs, streamed.decode()

    return async_to_sync(scenario)()
