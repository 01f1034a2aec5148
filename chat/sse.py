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


def sse_event_json(event: str, data_json: str, event_id: str) -> bytes:
    """An event whose data is JSON text already (a token as its result stream holds it)."""
    if "\n" in data_json or "\r" in data_json:
        # Only whitespace can hold a line break in JSON text, and on the wire it would end the
        # field: send the same value on one line.
        data_json = json.dumps(json.loads(data_json), separators=(",", ":"))
    return f"id: {event_id}\nevent: {event}\ndata: {data_json}\n\n".encode()


def sse_data(data: str) -> bytes:
    """An unnamed event, as OpenAI-style streams use."""
    return f"data: {data}\n\n".encode()


def sse_comment(text: str) -> bytes:
    return f": {text}\n\n".encode()


def sse_retry(milliseconds: int) -> bytes:
    return f"retry: {milliseconds}\n\n".encode()
