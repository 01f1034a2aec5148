"""Server-sent events framing: the only place that knows the wire format."""

import json
from typing import Any

SSE_HEADERS = {
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",  # nginx: pass each event through at once
}


def sse_event(event: str, data: Any, event_id: str | None = None) -> bytes:
    lines = []
    if event_id is not None:
        lines.append(f"id: {event_id}")
    lines.append(f"event: {event}")
    lines.append("data: " + json.dumps(data, separators=(",", ":")))
    return ("\n".join(lines) + "\n\n").encode()


def sse_data(data: str) -> bytes:
    """An unnamed event, as OpenAI-style streams use."""
    return f"data: {data}\n\n".encode()


def sse_comment(text: str) -> bytes:
    return f": {text}\n\n".encode()


def sse_retry(milliseconds: int) -> bytes:
    return f"retry: {milliseconds}\n\n".encode()
