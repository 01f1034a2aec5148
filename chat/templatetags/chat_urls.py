from uuid import UUID

from django import template

from chat.consumers import stream_url as _stream_url

register = template.Library()


@register.simple_tag
def stream_url(request_id: UUID | str) -> str:
    """The URL of a request's answer stream, which no view of the URLconf serves."""
    return _stream_url(request_id)
