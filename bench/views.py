"""The framework's ceiling for the fan-out benchmark: a bare Django async SSE endpoint that
only emits tokens (no Redis, no worker). Mounted only when BENCH_ENDPOINTS is on.

Streams of one run wait for its start signal, so the figure measures N streams flowing at once,
not how fast N connections can be opened.

Both measurements run in the same web process, so each starts by collecting the garbage the
one before left (`collect`): thousands of finished requests' reference cycles would otherwise be
walked by a full collection during the next measurement, stopping its streams for the other's
leftovers.
"""

import asyncio
import gc
import time

from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from chat.sse import SSE_HEADERS, sse_event

_starts: dict[str, asyncio.Event] = {}


@require_GET
async def bare_tokens(request: HttpRequest) -> StreamingHttpResponse:
    count = min(int(request.GET.get("tokens", "50")), 10_000)
    start = _starts.setdefault(request.GET.get("run", ""), asyncio.Event())

    async def events():
        yield sse_event("status", {"state": "queued"}, "0")
        await start.wait()
        for seq in range(count):
            yield sse_event("token", {"seq": seq, "text": "token "}, str(seq))
            await asyncio.sleep(0)  # yield to the other streams, as a relay awaiting Redis does
        yield sse_event("done", {"finish_reason": "length"}, str(count))

    return StreamingHttpResponse(events(), content_type="text/event-stream", headers=SSE_HEADERS)


@csrf_exempt
@require_POST
async def bare_start(request: HttpRequest) -> HttpResponse:
    _starts.setdefault(request.GET.get("run", ""), asyncio.Event()).set()
    return HttpResponse(status=204)


@csrf_exempt
@require_POST
async def collect(request: HttpRequest) -> JsonResponse:
    started = time.perf_counter()
    freed = gc.collect()
    return JsonResponse({"freed": freed, "ms": (time.perf_counter() - started) * 1000})
