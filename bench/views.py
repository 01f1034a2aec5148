"""The framework's ceiling for the fan-out benchmark: a bare Django async SSE endpoint that
only emits tokens (no Redis, no worker). Mounted only when BENCH_ENDPOINTS is on."""

import asyncio

from django.http import HttpRequest, StreamingHttpResponse
from django.views.decorators.http import require_GET

from chat.sse import SSE_HEADERS, sse_event


@require_GET
async def bare_tokens(request: HttpRequest) -> StreamingHttpResponse:
    count = min(int(request.GET.get("tokens", "50")), 10_000)

    async def events():
        for seq in range(count):
            yield sse_event("token", {"seq": seq, "text": "token "}, str(seq))
            await asyncio.sleep(0)  # yield to the other streams, as a relay awaiting Redis does
        yield sse_event("done", {"finish_reason": "length"}, str(count))

    return StreamingHttpResponse(events(), content_type="text/event-stream", headers=SSE_HEADERS)
