"""Generation jobs for tests that submit or enqueue without going through chat or the API."""

from __future__ import annotations

import uuid
from datetime import datetime

from django.conf import settings
from django.utils import timezone

from scheduler.generation import GenerationJob, Origin, SamplingParams, Tier
from scheduler.models import Generation

# The model name the test workers serve, and that the variants `stable` and `candidate` name.
MODEL = settings.INFERENCE_MODEL_NAME
# A tool an API request offers the model, in OpenAI's shape.
ORDER_TOOL = {
    "type": "function",
    "function": {
        "name": "order_status",
        "description": "Look up where an order is.",
        "parameters": {
            "type": "object",
            "properties": {"order_id": {"type": "string"}},
            "required": ["order_id"],
        },
    },
}


def generation_job(
    request_id: str | None = None,
    *,
    tier: str = Tier.NORMAL,
    variant: str = "stable",
    model: str = MODEL,
    client_id: str = "c1",
    messages: list[dict[str, str]] | None = None,
    origin: Origin = Origin.CHAT,
    max_tokens: int = 16,
    disconnect_grace_s: float | None = None,
) -> GenerationJob:
    return GenerationJob(
        request_id=request_id or str(uuid.uuid4()),
        origin=origin,
        messages=messages if messages is not None else [{"role": "user", "content": "Hello?"}],
        sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0, top_p=1.0),
        client_id=client_id,
        tier=Tier(tier),
        variant=variant,
        model=model,
        disconnect_grace_s=disconnect_grace_s,
    )


def generation_record(
    *,
    variant: str = "stable",
    status: str = "done",
    text: str = "Hi",
    error_code: str = "",
    ttft_ms: float | None = None,
    origin: Origin = Origin.CHAT,
    finished_at: datetime | None = None,
    grounding: dict | None = None,
) -> Generation:
    """A generation as admission and its worker leave it (pending ones are not finished)."""
    return Generation.objects.create(
        request_id=uuid.uuid4(),
        origin=origin,
        variant=variant,
        model=MODEL,
        tier=Tier.NORMAL,
        status=status,
        text=text,
        error_code=error_code,
        ttft_ms=ttft_ms,
        grounding=grounding,
        finished_at=None if status == "pending" else (finished_at or timezone.now()),
    )
