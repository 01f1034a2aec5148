"""The framework's ceiling for the fan-out benchmark: a bare Django async SSE endpoint that
only emits tokens (no Redis, no worker). Mounted only when BENCH_ENDPOINTS is on."""

import asyncio
import time

from django.http import HttpRequest, StreamingHttpResponse
from django.views.decorators.http import require_GET

from chat.sse import SSE_HEADERS, sse_event


@require_GET
async def bare_tokens(request: HttpRequest) -> StreamingHttpResponse:
    count = min(int(request.GET.get("tokens", "50")), 10_000)
    start_at = float(request.GET.get("start_at", "0"))  # unix time: every stream starts together

    async def events():
        yield sse_event("status", {"state": "queued"}, "0")
        await asyncio.sleep(max(0.0, start_at - time.time()))
        for seq in range(count):
            yield sse_event("token", {"seq": seq, "text": "token "}, str(seq))
            await asyncio.sleep(0)  # yield to the other streams, as a relay awaiting Redis does
        yield sse_event("done", {"finish_reason": "length"}, str(count))

    return StreamingHttpResponse(events(), content_type="text/event-stream", headers=SSE_HEADERS)
