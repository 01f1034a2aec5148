"""GET /metrics: Prometheus text for this web process and the fleet it reads from Redis."""

from http import HTTPStatus

from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from scheduler.metrics import scrape_refusal, web_exposition


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    refusal = scrape_refusal(
        authorization=request.headers.get("Authorization"),
        peer_address=request.META.get("REMOTE_ADDR", ""),
        forwarded_for=request.headers.get("X-Forwarded-For", request.headers.get("Forwarded")),
    )
    if refusal is not None:
        response = HttpResponse(
            f"{refusal.phrase}: see METRICS_TOKEN and METRICS_ALLOWED_NETWORKS.\n",
            status=refusal,
            content_type="text/plain; charset=utf-8",
        )
        if refusal == HTTPStatus.UNAUTHORIZED:
            response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    # The classic text format, which every Prometheus reads: no name here needs escaping.
    return HttpResponse(web_exposition(), content_type=CONTENT_TYPE_PLAIN_0_0_4)
